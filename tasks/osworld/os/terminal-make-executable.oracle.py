pyautogui.typewrite("chmod u+x ~/Desktop/run.sh\n")
time.sleep(2)
