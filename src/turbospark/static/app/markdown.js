// Model output is untrusted: Markdown is rendered by marked with raw HTML
// shown as text and images turned into links (nothing loads), then the HTML
// goes through DOMPurify (no script, no handlers, no javascript: URLs).
import { Marked } from "./vendor/marked.esm.js";
import "./vendor/purify.min.js";

const DOMPurify = globalThis.DOMPurify;
const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escape = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ESC[c]);

const marked = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    html: ({ text }) => escape(text),
    image: ({ href, text }) => `<a href="${escape(href)}">${escape(text || href)}</a>`,
  },
});

const PURIFY = {
  ALLOWED_TAGS: ["a", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
    "i", "input", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "sup", "table", "tbody", "td", "th",
    "thead", "tr", "ul"],
  ALLOWED_ATTR: ["href", "title", "class", "start", "align", "type", "checked", "disabled"],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
  RETURN_DOM_FRAGMENT: true,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("rel", "noopener noreferrer nofollow");
    node.setAttribute("target", "_blank");
  }
  if (node.tagName === "INPUT" && node.getAttribute("type") !== "checkbox") node.remove();
});

/** A sanitized DOM fragment of ``text`` read as Markdown. */
export function render(text) {
  const fragment = DOMPurify.sanitize(marked.parse(text || ""), PURIFY);
  for (const pre of fragment.querySelectorAll("pre")) {
    const copy = document.createElement("button");
    copy.type = "button"; copy.className = "copy"; copy.textContent = "Copy";
    copy.setAttribute("aria-label", "Copy this code");
    copy.addEventListener("click", () => navigator.clipboard?.writeText(pre.querySelector("code")?.textContent ?? ""));
    pre.prepend(copy);
  }
  return fragment;
}
