pyautogui.typewrite("uname -s\n")
time.sleep(2)
