"""Shader templates (NAME.glsl.j2) and shared GLSL includes; package data of texelflow."""
