"""Compatibility name: the shared testbench pieces live in codegen.check.sim_tb (rtlsim uses them too)."""
from bapipe.codegen.check.sim_tb import *  # noqa: F401,F403
from bapipe.codegen.check.sim_tb import (Counter, Handshakes, monitor, pauses, recv_words, send_all, settle, sink,  # noqa: F401
                            source, start, stream_check, to_signed, to_unsigned)
