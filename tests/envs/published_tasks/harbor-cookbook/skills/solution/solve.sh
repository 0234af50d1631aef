#!/bin/bash

echo "Hello from Harbor Skills!" > /app/greeting.txt
