// Keyboard shortcuts of the review page: 1-4 answer (left, right, tie, both bad), n writes a note, Esc leaves it.
// Plain JS, no library. The form posts as a normal form, so the page works without this file too.
(function () {
  const form = document.getElementById("judge");
  if (!form) return;
  const note = form.querySelector("textarea[name=note]");
  let sent = false;  // one answer per page: a second key press while the first is on its way sends nothing
  form.addEventListener("submit", (e) => { if (sent) e.preventDefault(); sent = true; });
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.target === note) {
      if (e.key === "Escape") note.blur();
      return;  // typing a note: digits are text
    }
    const button = form.querySelector(`button[data-key="${e.key}"]`);
    if (button) { e.preventDefault(); if (!sent) form.requestSubmit(button); }
    else if (e.key === "n") { e.preventDefault(); note.focus(); }
  });
})();
