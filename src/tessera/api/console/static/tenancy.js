/* tessera console, tenancy (docs/tenancy.md, docs/accounting.md): the login page with a local
   user's password (and the forced change of a generated first password), Log out that revokes
   the token on the server, and the Departments, Access, Audit and Reports pages. Loaded after
   app.js: it adds its pages to app.js's `pages` and its links to the nav. */
"use strict";

(function () {
  const nav = document.getElementById("nav");
  for (const [page, label] of [["departments", "Departments"], ["access", "Access"], ["reports", "Reports"], ["audit", "Audit"]]) {
    nav.append(h("a", { href: `#/${page}`, "data-page": page }, label));
  }

  /* Log out revokes the token on the server first (capture phase: before app.js forgets it). */
  document.addEventListener("click", (ev) => {
    if (!(ev.target instanceof Element) || ev.target.id !== "logout") return;
    const token = store.getItem(TOKEN_KEY);
    if (token) fetch("/api/v1/token", { method: "DELETE", keepalive: true, headers: { Authorization: `Bearer ${token}` } }).catch(() => {});
  }, true);

  const table = (id, headers, rows) => h("div", { class: "panel" }, h("table", { id },
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
  const iso = (d) => d.toISOString().replace(/\.\d{3}Z$/, "Z");
  const field = (label, el) => h("label", {}, label, el);

  pages.login = async function login() {
    const err = h("p", { class: "err", id: "login-error" });
    const token = h("textarea", { id: "token", rows: 3, placeholder: "a token from tessera login, or leave empty" });
    const user = h("input", { id: "username", autocomplete: "username" });
    const password = h("input", { id: "password", type: "password", autocomplete: "current-password" });
    const cid = h("input", { id: "client-id" });
    const secret = h("input", { id: "client-secret", type: "password" });
    const form = h("form", { class: "panel login", onsubmit: async (ev) => {
      ev.preventDefault(); err.textContent = "";
      try {
        let value = token.value.trim(); let mustChange = false;
        if (!value && user.value) {
          const r = await api("/api/v1/token", { method: "POST", login: true,
            body: { grantType: "password", username: user.value, password: password.value } });
          value = r.accessToken; mustChange = r.mustChangePassword;
        } else if (!value) {
          const r = await api("/api/v1/token", { method: "POST", login: true,
            body: { grantType: "client_credentials", clientId: cid.value, clientSecret: secret.value } });
          value = r.accessToken;
        }
        store.setItem(TOKEN_KEY, value);
        if (mustChange) { changePassword(user.value, password.value); return; }
        await api("/api/v1/overview", { login: true });
        location.hash = "#/overview";
      } catch (e) {
        store.removeItem(TOKEN_KEY);
        err.textContent = e.status === 401 ? "Wrong user name, password, token or credentials." : e.message;
      }
    } },
      h("h1", {}, "Log in to tessera"),
      field("User name", user), field("Password", password),
      h("p", { class: "muted" }, "or a token (tessera login), or an application's client credentials (the local admin's are in credentials.json):"),
      field("Token", token), field("Client id", cid), field("Client secret", secret),
      h("div", { class: "row", style: { marginTop: "12px" } }, h("button", { class: "btn", type: "submit", id: "login-button" }, "Log in")),
      err);
    put(main, form);
    user.focus();
    api("/api/v1/auth/oidc", { login: true }).then((o) => {
      if (o && o.enabled) form.insertBefore(h("div", { class: "row" }, h("a", { class: "btn", id: "sso-login", href: "/api/v1/auth/oidc/login" }, "Sign in with single sign-on")), form.children[1]);
    }).catch(() => {});
  };

  function changePassword(name, current) {
    const err = h("p", { class: "err", id: "password-error" });
    const next = h("input", { id: "new-password", type: "password", autocomplete: "new-password" });
    put(main, h("form", { class: "panel login", id: "change-password", onsubmit: async (ev) => {
      ev.preventDefault(); err.textContent = "";
      try {
        await api("/api/v1/me/password", { method: "POST", body: { currentPassword: current, newPassword: next.value } });
        const r = await api("/api/v1/token", { method: "POST", login: true, body: { grantType: "password", username: name, password: next.value } });
        store.setItem(TOKEN_KEY, r.accessToken);
        location.hash = "#/overview";
      } catch (e) { err.textContent = e.message; }
    } }, h("h1", {}, "Choose your password"),
      h("p", { class: "muted" }, `${name}: the first password was generated; choose your own (12 characters or more, three kinds of characters).`),
      field("New password", next),
      h("div", { class: "row" }, h("button", { class: "btn", type: "submit", id: "password-button" }, "Save")), err));
    next.focus();
  }

  pages.departments = async function departments() {
    const list = (await api("/api/v1/org-unit/departments")).departments;
    const err = h("p", { class: "err", id: "department-error" });
    const name = h("input", { id: "d-name" }); const deserved = h("input", { id: "d-deserved", value: "1", inputmode: "decimal" });
    const limit = h("input", { id: "d-limit", placeholder: "none", inputmode: "decimal" });
    const form = h("form", { class: "panel", id: "create-department", onsubmit: async (ev) => {
      ev.preventDefault(); err.textContent = "";
      try {
        await api("/api/v1/org-unit/departments", { method: "POST", body: { name: name.value,
          resources: { gpu: { deserved: Number(deserved.value), limit: limit.value === "" ? null : Number(limit.value) } } } });
        toast(`department ${name.value} created`); await departments();
      } catch (e) { err.textContent = e.message; }
    } }, h("h2", {}, "New department"), h("div", { class: "row" }, field("Name", name), field("Deserved GPUs", deserved), field("Limit", limit),
      h("button", { class: "btn", type: "submit" }, "Create")), err);
    put(main, h("h1", {}, "Departments"),
      table("departments", ["Department", "Deserved", "Limit", "Projects deserve", "Projects"], list.map((d) => {
        const g = d.resources.gpu;
        return h("tr", { "data-department": d.name }, h("td", {}, h("strong", {}, d.name)), h("td", {}, fmtGpus(g.deserved)),
          h("td", {}, g.limit === null ? "none" : fmtGpus(g.limit)), h("td", {}, fmtGpus(d.projectsDeserved)), h("td", {}, d.projects.join(", ") || "—"));
      })), form);
  };

  pages.access = async function access() {
    const me = await api("/api/v1/me");
    let rules = [];
    try { rules = (await api("/api/v1/authorization/access-rules")).accessRules; } catch (e) {
      if (e.status !== 403) throw e;  /* a viewer or researcher: only its own rules (/me) */
      rules = me.accessRules;
    }
    const err = h("p", { class: "err", id: "rule-error" });
    const stype = h("select", { id: "r-subject-type" }, ["user", "group", "app"].map((x) => h("option", {}, x)));
    const subject = h("input", { id: "r-subject" });
    const role = h("select", { id: "r-role" }, ["researcher", "viewer", "department-admin", "admin"].map((x) => h("option", {}, x)));
    const scopeType = h("select", { id: "r-scope-type" }, ["project", "department", "cluster"].map((x) => h("option", {}, x)));
    const scope = h("input", { id: "r-scope" });
    const form = h("form", { class: "panel", id: "create-rule", onsubmit: async (ev) => {
      ev.preventDefault(); err.textContent = "";
      try {
        await api("/api/v1/authorization/access-rules", { method: "POST", body: { subjectType: stype.value, subjectId: subject.value,
          roleName: role.value, scopeType: scopeType.value, scopeId: scopeType.value === "cluster" ? "" : scope.value } });
        await access();
      } catch (e) { err.textContent = e.message; }
    } }, h("h2", {}, "New access rule"), h("div", { class: "row" }, field("Subject", stype), field("Name", subject), field("Role", role),
      field("Scope", scopeType), field("Project or department", scope), h("button", { class: "btn", type: "submit" }, "Add")), err);
    put(main, h("h1", {}, "Access"), h("p", { class: "muted", id: "me" }, `Signed in as ${me.kind} ${me.name}${me.groups.length ? ` (groups ${me.groups.join(", ")})` : ""}.`),
      table("rules", ["Subject", "Role", "Scope", "Created by", ""], rules.map((r) => h("tr", {},
        h("td", {}, `${r.subjectType} ${r.subjectId}`), h("td", {}, r.roleName), h("td", {}, r.scopeType === "cluster" ? "cluster" : `${r.scopeType} ${r.scopeId}`),
        h("td", {}, r.createdBy), h("td", {}, h("button", { class: "btn secondary", type: "button", onclick: async () => {
          try { await api(`/api/v1/authorization/access-rules/${r.id}`, { method: "DELETE" }); await access(); } catch (e) { toast(e.message); }
        } }, "Delete"))))), form);
  };

  pages.audit = async function audit() {
    const entries = (await api("/api/v1/audit/log?limit=500")).entries;
    put(main, h("h1", {}, "Audit"), table("audit", ["Time", "Who", "From", "What", "Status", "Result"], entries.map((e) => h("tr", {},
      h("td", {}, e.timestamp), h("td", {}, e.subject), h("td", {}, e.source), h("td", {}, `${e.method} ${e.path}`),
      h("td", {}, String(e.httpStatus)), h("td", {}, e.result)))));
  };

  pages.reports = async function reports() {
    const now = new Date();
    const from = h("input", { id: "rep-from", value: iso(new Date(now - 7 * 86400e3)) });
    const to = h("input", { id: "rep-to", value: iso(new Date(now.getTime() + 60e3)) });
    const by = h("select", { id: "rep-by" }, ["project", "department", "user", "workload"].map((x) => h("option", {}, x)));
    const out = h("div", { id: "report" }); const err = h("p", { class: "err", id: "report-error" });
    const draw = async () => {
      err.textContent = "";
      try {
        const q = new URLSearchParams({ from: from.value, to: to.value, by: by.value });
        const rows = (await api(`/api/v1/reports/usage?${q}`)).rows;
        const key = by.value; const peak = Math.max(1e-9, ...rows.map((r) => Math.max(r.gpu_hours_allocated, r.gpu_hours_used ?? 0)));
        const bar = (hours, cls, bg, title) => h("div", { class: `bar ${cls}`, title, style: { width: `${(100 * hours) / peak}%`, minWidth: "0", height: "8px", margin: "1px 0", background: bg } });
        const csv = [`${key},gpu_hours_allocated,gpu_hours_used`, ...rows.map((r) => `"${String(r[key]).replace(/"/g, '""')}",${r.gpu_hours_allocated},${r.gpu_hours_used ?? ""}`)].join("\n");
        const link = h("a", { id: "report-csv", class: "btn secondary", download: `gpu-hours-by-${key}.csv`,
          href: URL.createObjectURL(new Blob([csv + "\n"], { type: "text/csv" })) }, "Download CSV");
        put(out, table("report-table", [key, "GPU-hours allocated", "", "GPU-hours used"], rows.map((r) => h("tr", { "data-key": String(r[key]) },
          h("td", {}, String(r[key]) || "—"), h("td", {}, r.gpu_hours_allocated.toFixed(2)),
          h("td", { style: { width: "40%" } }, bar(r.gpu_hours_allocated, "allocated", color(String(r[key])), "allocated"),
            r.gpu_hours_used === null ? null : bar(r.gpu_hours_used, "used", "#555", "used (measured)")),
          h("td", {}, r.gpu_hours_used === null ? "—" : r.gpu_hours_used.toFixed(2))))), h("div", { class: "row" }, link));
      } catch (e) { err.textContent = e.message; }
    };
    put(main, h("h1", {}, "Reports: GPU-hours"), h("form", { class: "panel", onsubmit: (ev) => { ev.preventDefault(); draw(); } },
      h("div", { class: "row" }, field("From", from), field("To", to), field("By", by), h("button", { class: "btn", type: "submit", id: "report-button" }, "Show")), err), out);
    await draw();
  };

  /* app.js draws the page once every script has run (DOMContentLoaded) */
})();
