"""Every click command, each a thin layer over a library: generate, chat, serve,
bench, calibrate, and the options they share (options).  cli.py loads them on
demand.  May import anything below cli.
"""
