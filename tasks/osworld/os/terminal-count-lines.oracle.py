pyautogui.typewrite("wc -l < ~/Documents/numbers.txt > ~/Desktop/count.txt\n")
time.sleep(2)
