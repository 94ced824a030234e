// A small, safe markdown renderer for the chat page of `mlxspec serve`.
//
// It never parses HTML: the reply is read as plain text and turned into DOM nodes with
// createElement and text nodes only (no innerHTML), so a reply holding "<img onerror=...>" or
// "<script>" shows those characters and runs nothing.  Links keep only http(s) and mailto
// addresses; anything else (javascript:, data:, ...) stays text.  Each character keeps whether it
// came from an accepted draft token, so drafted text is coloured inside the rendered markdown too.
//
// Blocks: ``` fenced code (a language name after the fence is shown), # headings (1-4), - * +
// lists, 1. lists, > quotes, --- rules, paragraphs.  Inline: `code`, **bold**, *italic* / _italic_,
// [text](url), <https://...> autolinks.
"use strict";

const MD = (() => {
  const SAFE_URL = /^(https?:\/\/|mailto:)[^\s<>"]+$/i;

  // pieces: [[text, fromDraft], ...] -> {text, flags}: one flag per UTF-16 unit of text
  function flatten(pieces) {
    let text = "";
    const flags = [];
    for (const [t, d] of pieces) {
      text += t;
      for (let i = 0; i < t.length; i++) flags.push(!!d);
    }
    return {text, flags};
  }

  // Text [a, b) of the source as nodes: runs of drafted characters in <span class="draft">.
  function textNodes(src, a, b, parent) {
    let i = a;
    while (i < b) {
      const d = src.flags[i];
      let j = i + 1;
      while (j < b && src.flags[j] === d) j++;
      const piece = document.createTextNode(src.text.slice(i, j));
      if (d) {
        const span = document.createElement("span");
        span.className = "draft";
        span.appendChild(piece);
        parent.appendChild(span);
      } else {
        parent.appendChild(piece);
      }
      i = j;
    }
  }

  // Inline markdown of [a, b) into parent.
  function inline(src, a, b, parent) {
    const s = src.text;
    let i = a, plain = a;
    const flush = (to) => { if (to > plain) textNodes(src, plain, to, parent); };
    while (i < b) {
      const c = s[i];
      if (c === "\\" && i + 1 < b && "\\`*_[]()#+-.!<>".includes(s[i + 1])) {
        flush(i); plain = i + 1; i += 2; continue;
      }
      if (c === "`") {
        let ticks = 1;
        while (s[i + ticks] === "`") ticks++;
        const fence = "`".repeat(ticks);
        const end = s.indexOf(fence, i + ticks);
        if (end >= 0 && end + ticks <= b) {
          flush(i);
          const code = document.createElement("code");
          textNodes(src, i + ticks, end, code);
          parent.appendChild(code);
          i = plain = end + ticks;
          continue;
        }
      }
      if ((c === "*" || c === "_") && i + 1 < b) {
        const strong = s[i + 1] === c;
        const mark = strong ? c + c : c;
        const start = i + mark.length;
        const end = s.indexOf(mark, start + 1);
        const wordy = c === "_" && i > 0 && /\w/.test(s[i - 1]);  // snake_case stays text
        if (!wordy && end > start && end + mark.length <= b && s[start] !== " " && s[end - 1] !== " "
            && !s.slice(start, end).includes("\n\n")) {
          flush(i);
          const el = document.createElement(strong ? "strong" : "em");
          inline(src, start, end, el);
          parent.appendChild(el);
          i = plain = end + mark.length;
          continue;
        }
      }
      if (c === "[") {
        const close = s.indexOf("]", i + 1);
        if (close > i && close < b && s[close + 1] === "(") {
          const paren = s.indexOf(")", close + 2);
          const url = paren > 0 ? s.slice(close + 2, paren).trim() : "";
          if (paren > 0 && paren < b && SAFE_URL.test(url)) {
            flush(i);
            parent.appendChild(link(url, (el) => inline(src, i + 1, close, el)));
            i = plain = paren + 1;
            continue;
          }
        }
      }
      if (c === "<") {
        const close = s.indexOf(">", i + 1);
        const url = close > 0 ? s.slice(i + 1, close) : "";
        if (close > 0 && close < b && SAFE_URL.test(url)) {
          flush(i);
          parent.appendChild(link(url, (el) => textNodes(src, i + 1, close, el)));
          i = plain = close + 1;
          continue;
        }
      }
      i++;
    }
    flush(b);
  }

  function link(url, fill) {
    const a = document.createElement("a");
    a.href = url;  // checked by SAFE_URL: http(s) or mailto only
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    fill(a);
    return a;
  }

  // The source's lines as [start, end) offsets (end excludes the newline).
  function lines(text) {
    const out = [];
    let a = 0;
    for (;;) {
      const n = text.indexOf("\n", a);
      if (n < 0) { out.push([a, text.length]); return out; }
      out.push([a, n]);
      a = n + 1;
    }
  }

  const FENCE = /^ {0,3}(```|~~~)\s*([\w+#.-]*)\s*$/;
  const HEADING = /^(#{1,4})\s+/;
  const BULLET = /^\s{0,3}[-*+]\s+/;
  const NUMBER = /^\s{0,3}\d{1,9}[.)]\s+/;
  const QUOTE = /^\s{0,3}>\s?/;
  const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;

  // Render pieces ([[text, fromDraft], ...] or a string) into a fresh <div class="md">.
  function render(pieces) {
    const src = typeof pieces === "string" ? flatten([[pieces, false]]) : flatten(pieces);
    const root = document.createElement("div");
    root.className = "md";
    const ls = lines(src.text);
    const line = (k) => src.text.slice(ls[k][0], ls[k][1]);
    let k = 0;
    while (k < ls.length) {
      const l = line(k);
      let m;
      if ((m = FENCE.exec(l))) {  // a code block, to its closing fence (or the end: still streaming)
        const wrap = document.createElement("div");
        wrap.className = "codeblock";
        if (m[2]) {
          const lang = document.createElement("div");
          lang.className = "lang";
          lang.textContent = m[2];
          wrap.appendChild(lang);
        }
        const pre = document.createElement("pre");
        const code = document.createElement("code");
        let j = k + 1;
        while (j < ls.length && !new RegExp("^ {0,3}" + m[1] + "\\s*$").test(line(j))) j++;
        if (j > k + 1) textNodes(src, ls[k + 1][0], ls[j - 1][1], code);
        pre.appendChild(code);
        wrap.appendChild(pre);
        root.appendChild(wrap);
        k = j + 1;
        continue;
      }
      if (!l.trim()) { k++; continue; }
      if (RULE.test(l)) { root.appendChild(document.createElement("hr")); k++; continue; }
      if ((m = HEADING.exec(l))) {
        const h = document.createElement("h" + (m[1].length + 2));  // h3..h6: replies are not pages
        inline(src, ls[k][0] + m[0].length, ls[k][1], h);
        root.appendChild(h);
        k++;
        continue;
      }
      if (BULLET.test(l) || NUMBER.test(l)) {
        const ordered = NUMBER.test(l) && !BULLET.test(l);
        const re = ordered ? NUMBER : BULLET;
        const list = document.createElement(ordered ? "ol" : "ul");
        if (ordered) list.start = parseInt(l, 10) || 1;
        while (k < ls.length && re.test(line(k))) {
          const li = document.createElement("li");
          const start = ls[k][0] + re.exec(line(k))[0].length;
          let end = ls[k][1];
          k++;
          while (k < ls.length && /^\s{2,}\S/.test(line(k)) && !BULLET.test(line(k)) && !NUMBER.test(line(k))) {
            end = ls[k][1];  // a continuation line
            k++;
          }
          inline(src, start, end, li);
          list.appendChild(li);
        }
        root.appendChild(list);
        continue;
      }
      if (QUOTE.test(l)) {
        const q = document.createElement("blockquote");
        let first = true;
        while (k < ls.length && QUOTE.test(line(k))) {
          if (!first) q.appendChild(document.createElement("br"));
          inline(src, ls[k][0] + QUOTE.exec(line(k))[0].length, ls[k][1], q);
          first = false;
          k++;
        }
        root.appendChild(q);
        continue;
      }
      // a paragraph: lines up to a blank one or the start of another block
      const p = document.createElement("p");
      const start = ls[k][0];
      let end = ls[k][1];
      k++;
      while (k < ls.length && line(k).trim() && !FENCE.test(line(k)) && !HEADING.test(line(k))
             && !BULLET.test(line(k)) && !NUMBER.test(line(k)) && !QUOTE.test(line(k)) && !RULE.test(line(k))) {
        end = ls[k][1];
        k++;
      }
      inline(src, start, end, p);
      root.appendChild(p);
    }
    return root;
  }

  return {render};
})();
