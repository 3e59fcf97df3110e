"""Talent Identity HTTP API adapter."""
