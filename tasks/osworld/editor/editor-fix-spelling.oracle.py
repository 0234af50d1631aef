pyautogui.hotkey("ctrl", "a")
pyautogui.typewrite("The color of the sky.\nPick a color.\n")
pyautogui.hotkey("ctrl", "s")
time.sleep(2)
