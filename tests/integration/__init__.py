"""Tests that start a process or a server, or open a socket: the CLI as a user runs it, the simulator on loopback,
the bundled llama.cpp server, Ray, the browser."""
