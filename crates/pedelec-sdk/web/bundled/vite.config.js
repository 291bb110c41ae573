// Relative asset URLs: the browser test serves the build under /bundled/.
export default { base: "./", build: { outDir: "dist", emptyOutDir: true } };
