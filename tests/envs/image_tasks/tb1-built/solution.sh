#!/bin/bash
python3 -c "
import json
print('\n'.join(i['name'] for i in json.load(open('/srv/inventory.json')) if i['count'] < int('$LOW_MARK')))" > /srv/work/low.txt
