"""The command-line layer: parses arguments, calls the domain modules, prints.

Nothing below kohya_tuner/cli/ knows about the terminal; nothing in here decides
anything about training.
"""
