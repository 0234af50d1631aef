pyautogui.typewrite("""sed -i -e 's/"light"/"dark"/' -e 's/: 12/: 14/' ~/.config/notes-app/settings.json\n""")
time.sleep(2)
