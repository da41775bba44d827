// A small line chart on a canvas: enough for a sandbox's metrics without a charting library.
export class Chart {
  constructor(canvas, format) {
    this.canvas = canvas;
    this.format = format || ((v) => v.toFixed(1));
  }

  // draw plots points [{t (ms), v}] and returns the last value's label.
  draw(points) {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 300;
    const ht = c.clientHeight || 90;
    c.width = w * dpr;
    c.height = ht * dpr;
    const g = c.getContext('2d');
    g.scale(dpr, dpr);
    g.clearRect(0, 0, w, ht);
    if (points.length === 0) {
      g.fillStyle = '#667085';
      g.fillText('no samples yet', 8, ht / 2);
      return '—';
    }
    const t0 = points[0].t;
    const t1 = Math.max(points[points.length - 1].t, t0 + 1);
    const max = Math.max(...points.map((p) => p.v), 1e-9) * 1.1;
    const x = (t) => 4 + ((t - t0) / (t1 - t0)) * (w - 8);
    const y = (v) => ht - 4 - (v / max) * (ht - 16);
    g.strokeStyle = '#2457c5';
    g.lineWidth = 1.5;
    g.beginPath();
    points.forEach((p, i) => (i ? g.lineTo(x(p.t), y(p.v)) : g.moveTo(x(p.t), y(p.v))));
    g.stroke();
    g.fillStyle = '#667085';
    g.fillText('max ' + this.format(max / 1.1), 6, 11);
    return this.format(points[points.length - 1].v);
  }
}
