int tessera_dep_symbol(void) { return 42; }
