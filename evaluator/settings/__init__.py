"""The settings: `configs/default.toml` and the flags, checked (`load`) into frozen sections, one per TOML
table (`sections`), and the options of one invocation apart (`invocation`)."""
