"""Where a line is: one int orders the lines of a stream across all of its files.

A position is (generation << GEN_SHIFT) + byte offset: the files of one stream (a container's
rotations, restarts) are its generations, so positions stay ordered across them, and a request
open since an older file holds the checkpoint in that file.
"""

GEN_SHIFT = 40
IN_FILE = (1 << GEN_SHIFT) - 1  # position & IN_FILE: the byte offset within its file
