pyautogui.typewrite("Meeting moved to 10:30")
pyautogui.hotkey("ctrl", "s")
time.sleep(2)
