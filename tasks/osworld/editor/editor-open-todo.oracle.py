pyautogui.typewrite("mousepad ~/Documents/todo.txt &\n")
time.sleep(3)
