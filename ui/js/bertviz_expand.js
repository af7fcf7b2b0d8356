// Attention Explorer: bertviz's parameters arrive compact. Numbers are integers in 1/scale, and
// the sentence-pair blocks are {"ae_block": [row0, row1, col0, col1]} ranges into the full matrix
// instead of second copies. Rebuild what bertviz's script expects before it reads them.
window.aeExpand = function (p, scale) {
  function unscale(x) { return Array.isArray(x) ? x.map(unscale) : x / scale; }
  function block(m, r0, r1, c0, c1) {
    return m.map(function (layer) { return layer.map(function (head) {
      return head.slice(r0, r1).map(function (row) { return row.slice(c0, c1); }); }); });
  }
  function rows(m, r0, r1) {
    return m.map(function (layer) { return layer.map(function (head) { return head.slice(r0, r1); }); });
  }
  var entries = Array.isArray(p.attention) ? p.attention : Object.values(p.attention);
  var full = entries[0];
  ["attn", "queries", "keys"].forEach(function (k) { if (full[k]) { full[k] = unscale(full[k]); } });
  entries.slice(1).forEach(function (e) {
    var b = e.attn.ae_block;
    e.attn = block(full.attn, b[0], b[1], b[2], b[3]);
    if (full.queries) { e.queries = rows(full.queries, b[0], b[1]); e.keys = rows(full.keys, b[2], b[3]); }
  });
  return p;
};
