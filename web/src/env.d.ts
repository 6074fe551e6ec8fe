// esbuild bundles the CSS a module imports into app-[hash].css.
declare module "*.css";
