import pyautogui
pyautogui.typewrite("printf 'Hello, OSWorld\\n' > ~/Desktop/hello.txt\n")
time.sleep(2)
