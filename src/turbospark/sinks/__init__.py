"""Consumers of the event stream. Each sink only reads events; none computes
numbers the events do not carry."""
