"""REST routes of tenancy, Run:ai's shapes: ``POST /api/v1/token`` (client credentials or a
password grant), users, applications, roles, access rules and the caller itself. Departments,
the audit log and usage reports are in their own modules. Authorization is the guard's
(``tessera.api.tenancy.guard``); the routes only check what depends on the body (a rule may not
grant more than its granter holds)."""


import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tessera.api.auth import secret_hash
from tessera.api.backend import Backend, Conflict, NotFound
from tessera.api.tenancy import passwords
from tessera.api.tenancy.guard import ApiRefusal, principal_of
from tessera.api.tenancy.models import (
    AccessRuleCreate,
    AppCreate,
    PasswordChange,
    TokenGrant,
    UserCreate,
)
from tessera.api.tenancy.policy import Forbidden
from tessera.api.tenancy.roles import ROLE_TEXT, ROLES
from tessera.api.tenancy.service import Tenancy
from tessera.core.errors import InvalidRequest


def _source(request: Request) -> str:
    return request.client.host if request.client else "?"


def mount_auth(app: FastAPI, api: APIRouter, tenancy: Tenancy, backend: Backend) -> None:
    store, authz, tokens = tenancy.store, tenancy.authz, tenancy.tokens
    bearer = HTTPBearer(auto_error=False)

    def throttled(who: str, request: Request) -> None:
        wait = tenancy.throttle.wait(who, _source(request))
        if wait > 0:
            raise ApiRefusal(429, f"too many failed sign-ins for {who} from {_source(request)}; "
                             f"retry in {wait:.0f} s")

    @app.post("/api/v1/token", tags=["auth"])
    def token(body: TokenGrant, request: Request) -> dict[str, Any]:
        """A bearer token: ``client_credentials`` (an application's id and secret) or
        ``password`` (a local user). Wrong secrets are throttled per client and source."""
        if body.grantType == "password":
            if not body.username or body.password is None:
                raise ApiRefusal(422, "username: is required with grantType password (so is "
                                 "password)")
            request.state.audit_subject = f"user:{body.username}"
            throttled(body.username, request)
            user = store.user(body.username)
            if not passwords.verify(user[1] if user else None, body.password):
                tenancy.throttle.failed(body.username, _source(request))
                raise ApiRefusal(401, "wrong username or password")
            tenancy.throttle.succeeded(body.username, _source(request))
            assert user is not None
            value, expires = tenancy.issue("user", body.username, restricted=user[2])
            return {"accessToken": value, "expiresAt": int(expires),
                    "mustChangePassword": user[2]}
        client_id = body.clientId or body.AppId
        secret = body.clientSecret or body.AppSecret
        if not client_id or not secret:
            raise ApiRefusal(422, "clientId: is required with grantType client_credentials "
                             "(so is clientSecret)")
        request.state.audit_subject = f"app:{client_id}"
        throttled(client_id, request)
        stored = tokens.client_secret_hash(client_id)
        if stored is None or not secrets.compare_digest(stored, secret_hash(secret)):
            tenancy.throttle.failed(client_id, _source(request))
            raise ApiRefusal(401, "wrong clientId or clientSecret")
        tenancy.throttle.succeeded(client_id, _source(request))
        value, expires = tenancy.issue("app", client_id)
        return {"accessToken": value, "expiresAt": int(expires)}

    @app.delete("/api/v1/token", status_code=204, tags=["auth"])
    def revoke(
        request: Request,
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Response:
        """Revoke the bearer token this request carries (``tessera logout``, the console's
        Log out)."""
        if creds is not None and creds.scheme.lower() == "bearer":
            who = tenancy.resolve(creds.credentials)
            if who is not None:
                request.state.audit_subject = who.label
        if creds is None or creds.scheme.lower() != "bearer" \
                or not tenancy.revoke(creds.credentials):
            raise ApiRefusal(401, "authentication required: send the token to revoke as "
                             "Authorization: Bearer <token>")
        return Response(status_code=204)

    # -- the caller ------------------------------------------------------------------------------

    @api.get("/me", tags=["auth"])
    def me(request: Request) -> dict[str, Any]:
        """Who the token names, its groups and its access rules."""
        p = principal_of(request)
        return {"kind": p.kind, "name": p.name, "groups": list(p.groups),
                "mustChangePassword": p.restricted,
                "accessRules": [r.doc() for r in store.rules_of(p.subjects)]}

    @api.post("/me/password", status_code=204, tags=["auth"])
    def change_password(body: PasswordChange, request: Request) -> Response:
        """Change one's own password (required after a generated first password); every token
        of the user is revoked, so sign in again."""
        p = principal_of(request)
        user = store.user(p.name) if p.kind == "user" else None
        if user is None:
            raise ApiRefusal(422, "currentPassword: only local users have a password")
        throttled(p.name, request)
        if not passwords.verify(user[1], body.currentPassword):
            tenancy.throttle.failed(p.name, _source(request))
            raise ApiRefusal(422, "currentPassword: is wrong")
        passwords.check_policy(body.newPassword, p.name, "newPassword")
        if body.newPassword == body.currentPassword:
            raise InvalidRequest("newPassword", "must differ from the current password")
        store.set_password(p.name, passwords.hash_password(body.newPassword), False)
        tokens.remove_tokens_of("user", p.name)
        return Response(status_code=204)

    # -- users -----------------------------------------------------------------------------------

    @api.get("/users", tags=["users"])
    def list_users() -> dict[str, Any]:
        return {"users": [{"id": n, "username": n, "source": src, "mustChangePassword": mc,
                           "createdAt": _iso(c), "createdBy": by}
                          for n, mc, src, c, by in store.users()]}

    @api.post("/users", status_code=201, tags=["users"])
    def create_user(body: UserCreate, request: Request) -> dict[str, Any]:
        """A local user. Without ``password`` a first password is generated and returned once
        (``tempPassword``); it must be changed at first sign-in."""
        if store.user(body.username) is not None:
            raise Conflict(f"user {body.username} already exists")
        temp = None
        if body.password is None:
            temp = passwords.generate()
            hashed = passwords.hash_password(temp)
        else:
            passwords.check_policy(body.password, body.username)
            hashed = passwords.hash_password(body.password)
        store.add_user(body.username, hashed, temp is not None, "local",
                       principal_of(request).label)
        doc: dict[str, Any] = {"id": body.username, "username": body.username,
                               "mustChangePassword": temp is not None}
        if temp is not None:
            doc["tempPassword"] = temp
        return doc

    @api.delete("/users/{userId}", status_code=204, tags=["users"])
    def delete_user(userId: str) -> Response:
        """The user, its access rules and every token it holds."""
        if not store.delete_user(userId):
            raise NotFound(f"user {userId} not found")
        tokens.remove_tokens_of("user", userId)
        tokens.remove_tokens_of("sso", userId)
        return Response(status_code=204)

    @api.post("/users/{userId}/logout", status_code=204, tags=["users"])
    def logout_user(userId: str) -> Response:
        """Revoke every token of the user."""
        if store.user(userId) is None:
            raise NotFound(f"user {userId} not found")
        tokens.remove_tokens_of("user", userId)
        return Response(status_code=204)

    @api.post("/users/{userId}/reset-password", tags=["users"])
    def reset_password(userId: str) -> dict[str, Any]:
        """A new generated password (to be changed at sign-in); the user's tokens are revoked."""
        if store.user(userId) is None:
            raise NotFound(f"user {userId} not found")
        temp = passwords.generate()
        store.set_password(userId, passwords.hash_password(temp), True)
        tokens.remove_tokens_of("user", userId)
        return {"id": userId, "tempPassword": temp}

    # -- applications ----------------------------------------------------------------------------

    @api.get("/apps", tags=["apps"])
    def list_apps() -> dict[str, Any]:
        return {"apps": [{"id": c, "name": c, "createdAt": _iso(t)} for c, t in tokens.clients()]}

    @api.post("/apps", status_code=201, tags=["apps"])
    def create_app_(body: AppCreate) -> dict[str, Any]:
        """An application (client id and secret, like the local admin); its secret is shown
        once."""
        if tokens.client_secret_hash(body.name) is not None:
            raise Conflict(f"application {body.name} already exists")
        secret = secrets.token_urlsafe(32)
        tokens.set_client(body.name, secret_hash(secret))
        return {"id": body.name, "name": body.name, "clientId": body.name,
                "clientSecret": secret}

    @api.post("/apps/{appId}/secret", tags=["apps"])
    def regenerate(appId: str) -> dict[str, Any]:
        """A new secret; every token issued under the old one is revoked."""
        if tokens.client_secret_hash(appId) is None:
            raise NotFound(f"application {appId} not found")
        secret = secrets.token_urlsafe(32)
        tokens.set_client(appId, secret_hash(secret))
        tokens.remove_tokens_of("app", appId)
        return {"id": appId, "clientId": appId, "clientSecret": secret}

    @api.delete("/apps/{appId}", status_code=204, tags=["apps"])
    def delete_app(appId: str) -> Response:
        if not tokens.remove_client(appId):
            raise NotFound(f"application {appId} not found")
        return Response(status_code=204)

    # -- roles and access rules ------------------------------------------------------------------

    @api.get("/authorization/roles", tags=["access rules"])
    def roles() -> dict[str, Any]:
        return {"roles": [{"name": n, "description": ROLE_TEXT[n], "permissions": sorted(p)}
                          for n, p in ROLES.items()]}

    @api.get("/authorization/access-rules", tags=["access rules"])
    def list_rules(request: Request) -> dict[str, Any]:
        """The rules on scopes the caller may read rules of."""
        p = principal_of(request)
        out = [r.doc() for r in store.rules()
               if _rule_visible(authz, p, r.scope_type, r.scope)]
        return {"accessRules": out, "totalRecords": len(out)}

    @api.post("/authorization/access-rules", status_code=201, tags=["access rules"])
    def create_rule(body: AccessRuleCreate, request: Request) -> dict[str, Any]:
        """Give a role on a scope. Refused when the role is unknown, the scope does not exist,
        or the role holds a permission the caller does not hold there."""
        p = principal_of(request)
        if body.roleName not in ROLES:
            raise InvalidRequest("roleName", f"must be one of {', '.join(ROLES)}", body.roleName)
        project, department = _scope(body.scopeType, body.scopeId, backend, tenancy, p)
        if not authz.allowed(p, "access-rules:create", project, department):
            raise Forbidden("access-rules:create", _scope_text(body.scopeType, body.scopeId))
        missing = authz.holds_role(p, body.roleName, project, department)
        if missing is not None:
            raise ApiRefusal(403, f"permission denied: a rule may not grant more than its "
                             f"granter holds: role {body.roleName} includes {missing}, which "
                             f"you do not hold on {_scope_text(body.scopeType, body.scopeId)}")
        if body.subjectType == "app" and tokens.client_secret_hash(body.subjectId) is None:
            raise InvalidRequest("subjectId", "no application with this name", body.subjectId)
        if body.subjectType == "user" and store.user(body.subjectId) is None \
                and "@" not in body.subjectId:
            raise InvalidRequest("subjectId", "no user with this name (single sign-on users "
                                 "are named by their e-mail)", body.subjectId)
        if any(r.subject_type == body.subjectType and r.subject == body.subjectId
               and r.role == body.roleName and r.scope_type == body.scopeType
               and r.scope == (project or department or "")
               for r in store.rules_of([(body.subjectType, body.subjectId)])):
            raise Conflict("this access rule exists already")
        rule = store.add_rule(body.subjectType, body.subjectId, body.roleName, body.scopeType,
                              project or department or "", p.label)
        return rule.doc()

    @api.delete("/authorization/access-rules/{accessRuleId}", status_code=204,
                tags=["access rules"])
    def delete_rule(accessRuleId: str, request: Request) -> Response:
        p = principal_of(request)
        rule = store.rule(int(accessRuleId)) if accessRuleId.isdigit() \
            and len(accessRuleId) < 18 else None
        if rule is None or not _rule_visible(authz, p, rule.scope_type, rule.scope):
            raise NotFound(f"access rule {accessRuleId} not found")
        project = rule.scope if rule.scope_type == "project" else None
        department = rule.scope if rule.scope_type == "department" else None
        if not authz.allowed(p, "access-rules:delete", project, department):
            raise Forbidden("access-rules:delete", _scope_text(rule.scope_type, rule.scope))
        if rule.role == "admin" and rule.scope_type == "cluster" \
                and store.count_cluster_admins() <= 1:
            raise Conflict("the last admin rule on the cluster cannot be deleted (nobody could "
                           "manage tessera any more); give another subject the admin role first")
        store.delete_rule(rule.id)
        return Response(status_code=204)

    @app.exception_handler(Forbidden)
    async def _forbidden(_: Request, exc: Forbidden) -> JSONResponse:
        return JSONResponse({"code": 403, "message": str(exc),
                             "details": {"permission": exc.permission, "scope": exc.scope}},
                            status_code=403)


def _iso(t: float) -> str:
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _scope_text(scope_type: str, scope: str) -> str:
    return "the cluster" if scope_type == "cluster" else f"{scope_type} {scope}"


def _rule_visible(authz: Any, p: Any, scope_type: str, scope: str) -> bool:
    if scope_type == "cluster":
        return bool(authz.allowed(p, "access-rules:read"))
    if scope_type == "department":
        return bool(authz.allowed(p, "access-rules:read", department=scope))
    return bool(authz.allowed(p, "access-rules:read", scope))


def _scope(scope_type: str, scope: str, backend: Backend, tenancy: Tenancy,
           p: Any) -> tuple[str | None, str | None]:
    """(project, department) of a rule's scope, refused (naming scopeId) when it does not
    exist or the caller cannot see it: both read the same, so nothing leaks."""
    if scope_type == "cluster":
        if scope:
            raise InvalidRequest("scopeId", "must be empty when scopeType is cluster", scope)
        return None, None
    if not scope:
        raise InvalidRequest("scopeId", f"is required when scopeType is {scope_type}")
    if scope_type == "department":
        if tenancy.store.department(scope) is None or \
                not tenancy.authz.allowed(p, "departments:read", department=scope):
            raise InvalidRequest("scopeId", "no department with this name", scope)
        return None, scope
    try:
        name = str(backend.project(scope)["name"])
    except NotFound:
        name = ""
    if not name or not tenancy.authz.allowed(p, "projects:read", name):
        raise InvalidRequest("scopeId", "no project with this name", scope)
    return name, None
