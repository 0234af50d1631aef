pyautogui.typewrite("gsettings set org.gnome.desktop.interface color-scheme prefer-dark\n")
time.sleep(2)
