"""Tenancy: who may do what (users, applications, SSO groups; roles and access rules with a
scope), departments above projects, the audit trail and GPU accounting. Shared by both backends:
everything here is kept in the API server's own SQLite database (docs/tenancy.md)."""
