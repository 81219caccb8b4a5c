"""The front end: TC text -> AST (parse) -> checked definitions (sema, range inference)."""
