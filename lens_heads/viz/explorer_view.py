"""The head explorer's HTML: its data as JSON in a ``<script type="application/json">`` block, markup, a small
vanilla-JS renderer (no library, no network) and its CSS, all scoped to one element id.

Text from prompts and tokens reaches the page only through the JSON block (where ``<``, ``>``, ``&`` and U+2028/9
are escaped, so nothing in it can end the block or open a comment) and is then set as ``textContent``, never as
markup.
"""

from __future__ import annotations

import json
import uuid

from lens_heads.viz.escape import esc

CSS = """
.lhx{font:13px system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d2330;max-width:100%;overflow:hidden}
.lhx-bar{display:flex;flex-wrap:wrap;gap:8px 16px;align-items:center;margin:4px 0 8px}
.lhx-main{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start;max-width:100%}
.lhx-map{flex:0 0 auto;max-width:100%;overflow:auto}
.lhx-grid{display:grid;gap:1px;background:#fff}
.lhx-grid div{width:18px;height:14px;cursor:pointer}
.lhx-grid div.lhx-sel{outline:2px solid #e0412b;outline-offset:-1px}
.lhx-grid span{font-size:10px;color:#566072;text-align:right;padding-right:3px;line-height:14px}
.lhx-detail{flex:1 1 420px;min-width:0;max-width:100%;overflow:auto}
.lhx-detail h3{margin:2px 0 6px;font-size:15px}
.lhx-pattern{border-collapse:collapse;font-size:10px;margin:4px 0}
.lhx-pattern td{width:11px;height:11px;padding:0;border:0}
.lhx-pattern th{font-weight:400;white-space:pre;padding:0 3px;color:#333;border:0;background:none}
.lhx-pattern thead th{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;max-height:90px;
  overflow:hidden;padding:2px 0}
.lhx-pattern tbody th{text-align:right;max-width:140px;overflow:hidden;text-overflow:ellipsis}
.lhx-facts{border-collapse:collapse;font-size:12px;margin:6px 0}
.lhx-facts td,.lhx-facts th{border-bottom:1px solid #e3e6eb;padding:2px 8px;text-align:right}
.lhx-facts td:first-child,.lhx-facts th:first-child{text-align:left}
.lhx-note{color:#566072;font-size:12px;margin:4px 0}
"""

JS = r"""
(function(){
var me=document.currentScript,scope=(me&&me.parentNode)||document;
function byId(id){return document.getElementById(id)||scope.querySelector("[id='"+id+"']");}
var root=byId(ROOT_ID),block=byId(ROOT_ID+"-data"); if(!root||!block) return;
var D=JSON.parse(block.textContent);
var L=D.n_layers,H=D.n_heads,sel={layer:0,head:0,prompt:0};
function q(c){return root.querySelector("."+c);}
function el(tag,text,cls){var e=document.createElement(tag);if(text!=null)e.textContent=text;if(cls)e.className=cls;return e;}
function fmt(x){return (x==null||isNaN(x))?"":(Math.abs(x)>=1000||Math.abs(x)<0.01&&x!==0?x.toExponential(2):x.toFixed(3));}
function shade(t){var a=[29,35,48],b=[253,231,37];
  return "rgb("+a.map(function(v,i){return Math.round(v+(b[i]-v)*t);}).join(",")+")";}
function blue(t){var v=Math.round(255*(1-t));return "rgb("+v+","+Math.round(255-140*t)+",255)";}
function decode(p){if(!p._bytes){var s=atob(p.patterns),b=new Uint8Array(s.length);
  for(var i=0;i<s.length;i++)b[i]=s.charCodeAt(i);p._bytes=b;}return p._bytes;}
function label(t){return t.replace(/\n/g,"\u21b5").replace(/\t/g,"\u21e5");}
function drawMap(){var m=D.maps[q("lhx-score").value],g=q("lhx-grid"),flat=[].concat.apply([],m.values);
  var lo=Math.min.apply(null,flat),hi=Math.max.apply(null,flat),span=(hi-lo)||1;
  g.textContent="";g.style.gridTemplateColumns="30px repeat("+H+",18px)";g.appendChild(el("span",""));
  for(var h=0;h<H;h++)g.appendChild(el("span",""+h));
  for(var l=0;l<L;l++){g.appendChild(el("span","L"+l));
    for(var h2=0;h2<H;h2++){var v=m.values[l][h2],t=(v-lo)/span,c=el("div");
      c.style.background=shade(m.direction==="<"?t:1-t);c.dataset.layer=l;c.dataset.head=h2;c.dataset.value=v;
      c.title="L"+l+"H"+h2+": "+fmt(v)+" (rank "+m.rank[l][h2]+" of "+(L*H)+")";
      if(l===sel.layer&&h2===sel.head)c.className="lhx-sel";g.appendChild(c);}}
  q("lhx-legend").textContent="dark = inactive side ("+(m.direction==="<"?"low":"high")+"); range "+fmt(lo)+" .. "+fmt(hi);}
function drawPattern(){var p=D.prompts[sel.prompt],n=p.tokens.length,b=decode(p),tri=n*(n+1)/2,
  off=(sel.layer*H+sel.head)*tri,t=el("table",null,"lhx-pattern"),hd=el("thead"),tr=el("tr");
  tr.appendChild(el("th",""));p.tokens.forEach(function(k){tr.appendChild(el("th",label(k)));});hd.appendChild(tr);
  t.appendChild(hd);var body=el("tbody"),i=off;
  for(var r=0;r<n;r++){var row=el("tr");row.appendChild(el("th",label(p.tokens[r])));
    for(var k=0;k<n;k++){var c=el("td");c.dataset.q=r;c.dataset.k=k;
      if(k<=r){var v=b[i++]/255;c.dataset.value=v;c.style.background=blue(v);
        c.title=label(p.tokens[r])+" \u2192 "+label(p.tokens[k])+": "+v.toFixed(3);}
      row.appendChild(c);}body.appendChild(row);}
  t.appendChild(body);var box=q("lhx-pattern-box");box.textContent="";box.appendChild(t);
  q("lhx-prompt-text").textContent="Prompt "+(sel.prompt+1)+": "+p.text+(p.truncated?" (cut to its first "+D.max_tokens+" tokens)":"");}
function facts(){var box=q("lhx-facts-box"),t=el("table",null,"lhx-facts"),hr=el("tr"),l=sel.layer,h=sel.head;
  box.textContent="";["map","mean","rank (1 = most inactive)"].concat(D.prompts.map(function(_,i){return "prompt "+(i+1);}))
    .forEach(function(s){hr.appendChild(el("th",s));});t.appendChild(hr);
  Object.keys(D.maps).forEach(function(name){var m=D.maps[name],r=el("tr"),si=D.score_names.indexOf(name);
    r.appendChild(el("td",name));r.appendChild(el("td",fmt(m.values[l][h])));r.appendChild(el("td",m.rank[l][h]+" / "+L*H));
    D.prompts.forEach(function(p){r.appendChild(el("td",si<0?"":fmt(p.scores[l][h][si])));});t.appendChild(r);});
  box.appendChild(t);var lr=D.layer_rank;
  q("lhx-layer").textContent="Layer "+l+" attention rank (90% energy, on "+D.rank_from+"): max "+
    fmt(lr.max[l])+", mean "+fmt(lr.mean[l])+(lr.lazy[l]?" \u2014 a lazy layer":"")+".";}
function select(){q("lhx-title").textContent="Head L"+sel.layer+"H"+sel.head;drawMap();drawPattern();facts();}
q("lhx-grid").addEventListener("click",function(e){var c=e.target;if(c.dataset&&c.dataset.layer!==undefined){
  sel.layer=+c.dataset.layer;sel.head=+c.dataset.head;select();}});
var s=q("lhx-score");Object.keys(D.maps).forEach(function(n){var o=el("option",n);o.value=n;s.appendChild(o);});
s.value=D.initial;s.addEventListener("change",drawMap);
var ps=q("lhx-prompt");D.prompts.forEach(function(p,i){var o=el("option","prompt "+(i+1));o.value=i;ps.appendChild(o);});
ps.addEventListener("change",function(){sel.prompt=+ps.value;drawPattern();});
var first=D.maps[D.initial].rank,best=null;
for(var l=0;l<L;l++)for(var h=0;h<H;h++)if(first[l][h]===L*H){best=[l,h];}
if(best){sel.layer=best[0];sel.head=best[1];}
q("lhx-source").textContent="Heatmap means over "+D.scores_from+"; scores per prompt on the shown tokens.";
select();
})();
"""

MARKUP = """<div class="lhx" id="{id}">
<div class="lhx-bar"><label>Colour by <select class="lhx-score"></select></label>
<label>Pattern on <select class="lhx-prompt"></select></label><span class="lhx-legend lhx-note"></span></div>
<div class="lhx-main"><div class="lhx-map"><div class="lhx-grid"></div><p class="lhx-note">rows: layers, columns:
heads; click a head</p><p class="lhx-note lhx-source"></p></div>
<div class="lhx-detail"><h3 class="lhx-title"></h3><p class="lhx-note lhx-prompt-text"></p>
<div class="lhx-pattern-box"></div><p class="lhx-note lhx-layer"></p><div class="lhx-facts-box"></div></div></div>
</div>"""


def script_json(data) -> str:
    """JSON safe inside an HTML <script> block: no ``</``, ``<!--``, ``]]>`` or line separators survive."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def explorer_fragment(data: dict, element_id: str | None = None) -> str:
    """The explorer as one HTML fragment (its own CSS and script, scoped to a fresh element id)."""
    element_id = element_id or f"lhx-{uuid.uuid4().hex[:12]}"
    script = JS.replace("ROOT_ID", json.dumps(element_id))
    return (f"<style>{CSS}</style>" + MARKUP.format(id=esc(element_id))
            + f'<script type="application/json" id="{esc(element_id)}-data">{script_json(data)}</script>'
            + f"<script>{script}</script>")


def standalone_page(data: dict) -> str:
    """A whole page holding the explorer; it requests nothing from outside."""
    title = esc(f"lens_heads head explorer: {data.get('model', '')}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; \
style-src 'unsafe-inline'; img-src data:">
<title>{title}</title></head><body style="margin:16px">
<h1 style="font:600 18px system-ui,sans-serif">{title}</h1>
{explorer_fragment(data)}
</body></html>
"""
