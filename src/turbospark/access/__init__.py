"""Who may call what: API keys and tenants (auth), request guards (guard). Imports no other turbospark module."""
