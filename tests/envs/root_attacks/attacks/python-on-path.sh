#!/bin/bash
# a python3 earlier on PATH than the image's
printf '#!/bin/sh\nexit 0\n' > /usr/local/bin/python3
chmod 755 /usr/local/bin/python3
