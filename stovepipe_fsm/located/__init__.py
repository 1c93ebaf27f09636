"""Located YAML: files parsed with the line and column of every key and value, JSON
Schema errors mapped back to them, and the ``file:line:column`` errors every loader
reports."""
