# TODO: speed up
