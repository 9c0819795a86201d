"""The model seam (``Model``) and its implementations: scripted, OpenAI-compatible, llama.cpp.

Implementation, not public API: import what you need from ``hermes_agent`` (docs/api.md).
"""
