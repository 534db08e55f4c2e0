/* tessera console, single sign-on (loaded before app.js): back from the provider the server
   sends the browser to #/sso/<token>; keep the token (localStorage, as app.js) and go on to the Overview
   before app.js routes (it would send a tab without a token to the login page). */
"use strict";
(function () {
  const m = location.hash.match(/^#\/sso\/([A-Za-z0-9_-]+)$/);
  if (m) {
    window.localStorage.setItem("tessera.token", m[1]); /* app.js keeps the token there too */
    history.replaceState(null, "", "#/overview");
  }
})();
