"""Tests of the model client and of the real LLM server (SmolLM2 on llama.cpp)."""
