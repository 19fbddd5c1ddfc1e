"""What every part of the engine stands on: settings and pool sizes, logging and redaction, named
fault points, the drain flag, Redis clients and sealing."""
