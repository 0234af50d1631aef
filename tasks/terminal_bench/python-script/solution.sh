#!/bin/bash
set -e
cat > fib.py <<'EOF'
a, b = 0, 1
for _ in range(10):
    print(a)
    a, b = b, a + b
EOF
python3 fib.py > fib.txt
