pyautogui.typewrite("mkdir -p ~/projects/alpha ~/projects/beta")
pyautogui.press("enter")
time.sleep(2)
