// plotly.js with only the trace types in traces.json, built the way plotly.js builds its own bundles
// (node_modules/plotly.js/esbuild-config.js: the same plugins, aliases and defines), minified, to
// src/flowscope/ui/static/plotly.min.js. Run: npm ci && npm run build (in this folder).
"use strict";
const fs = require("fs");
const path = require("path");
const esbuild = require("esbuild");
const { environmentPlugin } = require("esbuild-plugin-environment");
const { glsl } = require("esbuild-plugin-glsl");
const InlineCSSPlugin = require("esbuild-plugin-inline-css");

const traces = JSON.parse(fs.readFileSync(path.join(__dirname, "traces.json"), "utf8"));
const version = require("plotly.js/package.json").version;
const entry = "var Plotly = require('plotly.js/lib/core');\n" +
  "Plotly.register([" + traces.filter((t) => t !== "scatter")  // core registers scatter itself
    .map((t) => "require('plotly.js/lib/" + t + "')").join(", ") + "]);\nmodule.exports = Plotly;\n";
const out = path.join(__dirname, "..", "..", "src", "flowscope", "ui", "static", "plotly.min.js");

esbuild.build({
  stdin: { contents: entry, resolveDir: __dirname, sourcefile: "flowscope-plotly.js" },
  outfile: out,
  format: "iife",
  globalName: "Plotly",
  bundle: true,
  minify: true,
  legalComments: "eof",
  banner: { js: "/* plotly.js " + version + " (MIT, https://github.com/plotly/plotly.js), partial bundle of " +
                "flowscope: traces " + traces.join(", ") + ". Built by scripts/plotly-bundle/build.js. */" },
  plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
  alias: { regl: "@plotly/regl", stream: "stream-browserify" },
  define: { global: "window", "define.amd": "false" },
  target: "es2016",
  logLevel: "info",
}).catch(() => process.exit(1));
