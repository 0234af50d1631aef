pyautogui.typewrite("gsettings set org.gnome.desktop.interface clock-format 12h\n")
time.sleep(2)
