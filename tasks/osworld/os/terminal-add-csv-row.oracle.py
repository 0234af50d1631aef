pyautogui.typewrite("echo bob,25 >> ~/Desktop/people.csv\n")
time.sleep(2)
