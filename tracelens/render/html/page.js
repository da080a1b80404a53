(function () {
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message)); });
  function key(td, numeric) {
    var v = td.getAttribute('data-v');
    if (v === null) v = td.textContent;
    if (numeric) { var x = parseFloat(v); return isNaN(x) ? -Infinity : x; }
    return v.toLowerCase();
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.querySelectorAll('th').forEach(function (th, i) {
      th.addEventListener('click', function () {
        var numeric = th.classList.contains('n');
        var asc = th.getAttribute('data-sort') !== 'asc';
        table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('data-sort'); });
        th.setAttribute('data-sort', asc ? 'asc' : 'desc');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[i], numeric), y = key(b.cells[i], numeric);
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  // the embedded report: plain JSON, or gzip + base64 when large (decompressed by the browser)
  function loadReport() {
    var plain = document.getElementById('tracelens-report');
    if (plain) return Promise.resolve(JSON.parse(plain.textContent));
    var b64 = atob(document.getElementById('tracelens-report-gz').textContent.trim());
    var bytes = new Uint8Array(b64.length);
    for (var i = 0; i < b64.length; i++) bytes[i] = b64.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Response(stream).text().then(JSON.parse);
  }
  var sum = 0;
  document.querySelectorAll('#waterfall .bar[data-fraction]').forEach(function (b) { sum += parseFloat(b.getAttribute('data-fraction')); });
  document.body.setAttribute('data-waterfall-sum', sum.toFixed(9));
  loadReport().then(function (report) {
    window.tracelensReport = report;
    document.body.setAttribute('data-ranks', String(report.ranks.length));
  }).catch(function (e) { errors.push(String(e)); }).then(function () {
    document.body.setAttribute('data-js-errors', String(errors.length));
    document.body.setAttribute('data-ready', '1');
  });
})();
