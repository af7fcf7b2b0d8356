// Attention Explorer: bertviz's parameters arrive compact. Numbers are integers in 1/scale: weights as
// {"ae_b64": base64 of little-endian uint16, "shape": [...]} (2.7 bytes a weight instead of JSON's 2-6),
// queries and keys as JSON integers; the sentence-pair blocks are {"ae_block": [row0, row1, col0, col1]}
// ranges into the full matrix instead of second copies. Rebuild what bertviz's script expects before it
// reads them.
window.aeExpand = function (p, scale) {
  function unscale(x) { return Array.isArray(x) ? x.map(unscale) : x / scale; }
  function unpack(packed) {
    var bytes = atob(packed.ae_b64), view = new DataView(new ArrayBuffer(bytes.length));
    for (var i = 0; i < bytes.length; i++) { view.setUint8(i, bytes.charCodeAt(i)); }
    var shape = packed.shape, at = 0;
    function build(depth) {
      var out = new Array(shape[depth]);
      for (var j = 0; j < shape[depth]; j++) {
        if (depth === shape.length - 1) { out[j] = view.getUint16(2 * at++, true) / scale; } else { out[j] = build(depth + 1); }
      }
      return out;
    }
    return build(0);
  }
  function block(m, r0, r1, c0, c1) {
    return m.map(function (layer) { return layer.map(function (head) {
      return head.slice(r0, r1).map(function (row) { return row.slice(c0, c1); }); }); });
  }
  function rows(m, r0, r1) {
    return m.map(function (layer) { return layer.map(function (head) { return head.slice(r0, r1); }); });
  }
  var entries = Array.isArray(p.attention) ? p.attention : Object.values(p.attention);
  var full = entries[0];
  ["attn", "queries", "keys"].forEach(function (k) {
    if (full[k]) { full[k] = full[k].ae_b64 !== undefined ? unpack(full[k]) : unscale(full[k]); }
  });
  entries.slice(1).forEach(function (e) {
    var b = e.attn.ae_block;
    e.attn = block(full.attn, b[0], b[1], b[2], b[3]);
    if (full.queries) { e.queries = rows(full.queries, b[0], b[1]); e.keys = rows(full.keys, b[2], b[3]); }
  });
  return p;
};
