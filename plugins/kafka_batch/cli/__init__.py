"""The `kafka-batch` command (commands) and the references written from the code (reference): the definition's
from its typed model, the command line's from its parser."""
