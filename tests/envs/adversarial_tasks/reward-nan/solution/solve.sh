#!/bin/bash
echo nan > /app/count.txt
