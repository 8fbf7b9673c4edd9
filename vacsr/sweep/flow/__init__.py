"""The sweep driver: datasets -> search -> final runs -> table, and its recovery from a stop."""
