"""Plain types and errors shared by every step of the loop. No I/O lives here."""
