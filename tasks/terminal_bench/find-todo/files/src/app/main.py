x = 1  # TODO
