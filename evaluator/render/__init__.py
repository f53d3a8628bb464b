"""Rendering: analyses' typed results -> `report.md` sections and PNG figures. Computes nothing, reads no file."""
