// Stylesheets imported for esbuild to bundle into app.css.
declare module "*.css";
