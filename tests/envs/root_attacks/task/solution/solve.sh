#!/bin/bash
# the honest solution: it needs root (/usr/local/bin is root's), as published solutions often do
set -e
printf '#!/bin/sh\nwc -l < "$1"\n' > /usr/local/bin/count-lines
chmod 755 /usr/local/bin/count-lines
count-lines /app/data.txt > /app/count.txt
echo "counted=yes" > /etc/count-lines.conf
