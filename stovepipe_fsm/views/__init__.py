"""Views of the domain for people and tools: JSON documents and text tables."""
