"""`python -m liyagent ...` is the `liyagent` command."""

from liyagent.cli.main import main

raise SystemExit(main())
