"""Tests of the HTTP adapters (mirror, proxy, review API) and the SQLite store."""
