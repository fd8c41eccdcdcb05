//! `#[narad_guest::router]`: turns one safe routing function into a Narad plugin.
//!
//! Layout: this file holds the attribute entry point and `expand`, which (1) parses and
//! checks the attribute's `name`, `version`, `description` and `needs` with the ABI crate's
//! own manifest rules, (2) checks the function's shape (3 parameters, or 4 with a leading
//! `&mut State`), (3) emits the function unchanged, a `pub static PLUGIN` descriptor, and a
//! wasm32-only module with the ABI exports and the `narad.manifest` custom section.
//!
//! Every problem is a spanned `compile_error!` (via `syn::Error::into_compile_error`), never a
//! panic, so the author sees the exact token at fault.

use narad_abi::{ABI_VERSION, MANIFEST_SECTION, Manifest, Needs, symbols};
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, FnArg, ItemFn, Lit, Meta, Token, Type};

/// Registers a routing function as the plugin of this crate. See `narad_guest::router`.
#[proc_macro_attribute]
pub fn router(
    attr: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    expand(attr.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// The checked attribute arguments.
struct Args {
    name: String,
    version: String,
    description: String,
    needs: Needs,
    probe_config: Option<String>,
}

fn string_value(expr: &Expr, key: &str) -> syn::Result<String> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.value()),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{key}` takes a string literal, e.g. {key} = \"...\""),
        )),
    }
}

fn parse_needs(expr: &Expr) -> syn::Result<Needs> {
    let Expr::Array(array) = expr else {
        return Err(syn::Error::new(
            expr.span(),
            "`needs` takes a list, e.g. needs = [headers, values]",
        ));
    };
    let (mut keys, mut headers, mut values, mut key_hash) = (false, false, false, false);
    let mut key_hash_only = None;
    for elem in &array.elems {
        let ident = match elem {
            Expr::Path(p) => p.path.get_ident().map(ToString::to_string),
            _ => None,
        };
        match ident.as_deref() {
            Some("keys") => keys = true,
            Some("headers") => headers = true,
            Some("values") => values = true,
            Some("key_hash") => key_hash = true,
            Some("key_hash_only") => key_hash_only = Some(elem.span()),
            _ => {
                return Err(syn::Error::new(
                    elem.span(),
                    "unknown need: expected `keys`, `headers`, `values`, `key_hash` or `key_hash_only`",
                ));
            }
        }
    }
    if let Some(span) = key_hash_only {
        if array.elems.len() > 1 {
            return Err(syn::Error::new(
                span,
                "`key_hash_only` is a need of its own (the key hashes and no record table): list it alone",
            ));
        }
        return Ok(Needs::KEY_HASH_ONLY);
    }
    // As in the manifest: key bytes are given unless `key_hash` is asked for without `keys`.
    Ok(Needs::from_flags(
        keys || !key_hash,
        headers,
        values,
        key_hash,
    ))
}

fn parse_args(attr: TokenStream) -> syn::Result<Args> {
    let metas = syn::parse::Parser::parse2(
        Punctuated::<Meta, Token![,]>::parse_terminated,
        attr.clone(),
    )?;
    let mut name: Option<(String, Span)> = None;
    let mut version: Option<(String, Span)> = None;
    let mut description: Option<(String, Span)> = None;
    let mut needs: Option<Needs> = None;
    let mut probe_config: Option<String> = None;
    for meta in &metas {
        let Meta::NameValue(nv) = meta else {
            return Err(syn::Error::new(
                meta.span(),
                "expected `key = value` (name, version, description, needs, probe_config)",
            ));
        };
        let key = nv
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        let duplicate = || syn::Error::new(nv.path.span(), format!("`{key}` given twice"));
        let span = nv.value.span();
        match key.as_str() {
            "name" if name.is_some() => return Err(duplicate()),
            "version" if version.is_some() => return Err(duplicate()),
            "description" if description.is_some() => return Err(duplicate()),
            "needs" if needs.is_some() => return Err(duplicate()),
            "probe_config" if probe_config.is_some() => return Err(duplicate()),
            "name" => name = Some((string_value(&nv.value, "name")?, span)),
            "version" => version = Some((string_value(&nv.value, "version")?, span)),
            "description" => {
                description = Some((string_value(&nv.value, "description")?, span));
            }
            "needs" => needs = Some(parse_needs(&nv.value)?),
            "probe_config" => probe_config = Some(string_value(&nv.value, "probe_config")?),
            _ => {
                return Err(syn::Error::new(
                    nv.path.span(),
                    "unknown argument: expected name, version, description, needs or probe_config",
                ));
            }
        }
    }
    let whole = if attr.is_empty() {
        Span::call_site()
    } else {
        attr.span()
    };
    let (name, name_span) =
        name.ok_or_else(|| syn::Error::new(whole, "missing `name = \"...\"`"))?;
    let (description, description_span) = description
        .ok_or_else(|| syn::Error::new(whole, "missing `description = \"...\"` (one line)"))?;
    if description.trim().is_empty() {
        return Err(syn::Error::new(description_span, "description is empty"));
    }
    let (version, version_span) = match version {
        Some(v) => v,
        // Cargo sets this for the crate being compiled, which is where the macro runs.
        None => (
            std::env::var("CARGO_PKG_VERSION").unwrap_or_else(|_| "0.0.0".into()),
            whole,
        ),
    };
    let args = Args {
        name,
        version,
        description,
        needs: needs.unwrap_or_default(),
        probe_config,
    };
    // The ABI crate's own rules, so the macro and the host's deploy check cannot disagree.
    if let Err(e) = narad_abi::validate_plugin_name(&args.name) {
        return Err(syn::Error::new(name_span, e.to_string()));
    }
    if let Err(e) = manifest(&args).validate() {
        let span = match e {
            narad_abi::ManifestError::BadVersion => version_span,
            narad_abi::ManifestError::BadDescription => description_span,
            _ => whole,
        };
        return Err(syn::Error::new(span, e.to_string()));
    }
    Ok(args)
}

fn manifest(args: &Args) -> Manifest {
    Manifest {
        name: args.name.clone(),
        version: args.version.clone(),
        abi: ABI_VERSION,
        needs: args.needs,
        description: args.description.clone(),
        // Without it the deploy check hands the router an empty config.
        probe_config: args.probe_config.clone(),
    }
}

/// The state type of a 4-parameter router (`&mut T` → `T`), or `None` for 3 parameters.
fn state_type(func: &ItemFn) -> syn::Result<Option<Type>> {
    let sig = &func.sig;
    if let Some(t) = &sig.asyncness {
        return Err(syn::Error::new(t.span(), "a router cannot be async"));
    }
    if let syn::Safety::Unsafe(t) = &sig.safety {
        return Err(syn::Error::new(t.span(), "a router must be a safe fn"));
    }
    if sig.constness.is_some() || sig.abi.is_some() || sig.variadic.is_some() {
        return Err(syn::Error::new(
            sig.span(),
            "a router is a plain `fn` (no const, extern or variadics)",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "a router cannot be generic",
        ));
    }
    if let Some(receiver) = sig.receiver() {
        return Err(syn::Error::new(
            receiver.span(),
            "a router is a free function, not a method",
        ));
    }
    match sig.inputs.len() {
        3 => Ok(None),
        4 => match sig.inputs.first() {
            Some(FnArg::Typed(pt)) => match &*pt.ty {
                Type::Reference(r) if r.mutability.is_some() => Ok(Some((*r.elem).clone())),
                other => Err(syn::Error::new(
                    other.span(),
                    "the first of four parameters is the router's state: `&mut State`",
                )),
            },
            _ => Err(syn::Error::new(sig.inputs.span(), "unexpected receiver")),
        },
        _ => Err(syn::Error::new(
            sig.inputs.span(),
            "a router takes (ctx: &RouteContext, slab: &Slab, out: &mut Decisions), \
             optionally preceded by state: &mut State",
        )),
    }
}

/// The whole expansion; errors are spanned.
fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args = parse_args(attr)?;
    let func: ItemFn = syn::parse2(item)?;
    let state = state_type(&func)?;
    let json = serde_json::to_string(&manifest(&args))
        .map_err(|e| syn::Error::new(Span::call_site(), format!("manifest: {e}")))?;
    let json_bytes = syn::LitByteStr::new(json.as_bytes(), Span::call_site());
    let json_len = json.len();
    let fn_name = &func.sig.ident;
    let sig_span = func.sig.span();
    let (name, version, description) = (&args.name, &args.version, &args.description);
    let (keys, headers, values, key_hash) = (
        args.needs.keys(),
        args.needs.headers(),
        args.needs.values(),
        args.needs.key_hash(),
    );
    let needs = if args.needs.table() {
        quote!(::narad_guest::__private::Needs::from_flags(#keys, #headers, #values, #key_hash))
    } else {
        quote!(::narad_guest::__private::Needs::KEY_HASH_ONLY)
    };

    let (state_ty, route_fn, adapter) = match &state {
        Some(ty) => {
            let assert = quote_spanned! {ty.span()=>
                const _: fn() = || {
                    fn state_must_implement_default<T: ::core::default::Default>() {}
                    state_must_implement_default::<#ty>();
                };
            };
            (quote!(#ty), quote!(#fn_name), assert)
        }
        None => {
            let adapter_name = format_ident!("__narad_route_{}", fn_name);
            let adapter = quote_spanned! {sig_span=>
                #[doc(hidden)]
                fn #adapter_name(
                    _state: &mut (),
                    ctx: &::narad_guest::RouteContext<'_>,
                    slab: &::narad_guest::Slab<'_>,
                    out: &mut ::narad_guest::Decisions<'_>,
                ) -> ::core::result::Result<(), ::narad_guest::RouteError> {
                    #fn_name(ctx, slab, out)
                }
            };
            (quote!(()), quote!(#adapter_name), adapter)
        }
    };
    let (sym_version, sym_alloc, sym_dealloc, sym_route, sym_last_error) = (
        symbols::ABI_VERSION,
        symbols::ALLOC,
        symbols::DEALLOC,
        symbols::ROUTE,
        symbols::LAST_ERROR,
    );
    let section = MANIFEST_SECTION;

    Ok(quote! {
        #func

        #adapter

        /// This crate's routing plugin, generated by `#[narad_guest::router]`: its manifest
        /// and router, as used by the wasm exports and by `narad_guest::testing`.
        pub static PLUGIN: ::narad_guest::Plugin<#state_ty> = ::narad_guest::Plugin::new(
            #name,
            #version,
            #description,
            #needs,
            #json,
            #route_fn,
        );

        /// The router's per-instance state (one instance per link in the host).
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        static __NARAD_STATE: ::narad_guest::__private::InstanceCell<#state_ty> =
            ::narad_guest::__private::InstanceCell::new();

        /// The ABI v1 exports and manifest section (wasm32 only).
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __narad_exports {
            #[unsafe(export_name = #sym_version)]
            pub extern "C" fn narad_abi_version() -> i32 {
                ::narad_guest::__private::abi_version()
            }

            #[unsafe(export_name = #sym_alloc)]
            pub extern "C" fn narad_alloc(size: i32) -> i32 {
                ::narad_guest::__private::export_alloc(size)
            }

            /// # Safety
            /// The host passes a pointer and size from `narad_alloc`.
            #[unsafe(export_name = #sym_dealloc)]
            pub unsafe extern "C" fn narad_dealloc(ptr: i32, size: i32) {
                // SAFETY: the host's ABI promise, forwarded.
                unsafe { ::narad_guest::__private::export_dealloc(ptr, size) }
            }

            /// # Safety
            /// The host does not touch memory during the call.
            #[unsafe(export_name = #sym_route)]
            pub unsafe extern "C" fn narad_route(input_ptr: i32, input_len: i32, output_ptr: i32) -> i32 {
                // SAFETY: pointers are checked against linear memory inside.
                unsafe {
                    ::narad_guest::__private::route(
                        &super::PLUGIN,
                        &super::__NARAD_STATE,
                        input_ptr,
                        input_len,
                        output_ptr,
                    )
                }
            }

            #[unsafe(export_name = #sym_last_error)]
            pub extern "C" fn narad_last_error() -> i64 {
                ::narad_guest::__private::last_error()
            }

            #[used]
            #[unsafe(link_section = #section)]
            static NARAD_MANIFEST: [u8; #json_len] = *#json_bytes;
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    fn router_fn() -> TokenStream {
        quote! {
            fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> {
                Ok(())
            }
        }
    }

    fn error_of(attr: TokenStream, item: TokenStream) -> String {
        match expand(attr, item) {
            Ok(_) => panic!("expansion should fail"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_valid_router_expands_to_exports_and_a_manifest_section() {
        let out = expand(
            quote!(
                name = "key-hash",
                version = "1.2.3",
                description = "hashes keys",
                needs = [keys, values]
            ),
            router_fn(),
        )
        .unwrap()
        .to_string();
        assert!(out.contains("narad.manifest"));
        assert!(out.contains("\"narad_route\""));
        assert!(out.contains("pub static PLUGIN"));
        let json = r#"{\"name\":\"key-hash\",\"version\":\"1.2.3\",\"abi\":1,\"needs\":[\"keys\",\"values\"],\"description\":\"hashes keys\"}"#;
        assert!(out.contains(json), "{out}");
    }

    /// A router with these `needs` (and fixed name, version and description), expanded.
    fn expand_needs(needs: TokenStream) -> syn::Result<TokenStream> {
        expand(
            quote!(name = "h", version = "1", description = "x", needs = #needs),
            router_fn(),
        )
    }

    #[test]
    fn key_hash_alone_asks_for_no_key_bytes_and_with_keys_for_both() {
        let json_of = |needs: TokenStream| expand_needs(needs).unwrap().to_string();
        let alone = json_of(quote!([key_hash]));
        assert!(alone.contains(r#"\"needs\":[\"key_hash\"]"#), "{alone}");
        assert!(
            alone.contains("from_flags (false , false , false , true)"),
            "{alone}"
        );
        let both = json_of(quote!([keys, key_hash]));
        assert!(
            both.contains(r#"\"needs\":[\"keys\",\"key_hash\"]"#),
            "{both}"
        );
        let none = json_of(quote!([]));
        assert!(none.contains(r#"\"needs\":[\"keys\"]"#), "{none}");
    }

    #[test]
    fn key_hash_only_is_listed_alone_and_gives_no_record_table() {
        let only = expand_needs(quote!([key_hash_only])).unwrap().to_string();
        assert!(only.contains(r#"\"needs\":[\"key_hash_only\"]"#), "{only}");
        assert!(only.contains("Needs :: KEY_HASH_ONLY"), "{only}");
        let err = expand_needs(quote!([key_hash_only, keys])).unwrap_err();
        assert!(err.to_string().contains("list it alone"), "{err}");
    }

    #[test]
    fn a_probe_config_goes_into_the_manifest_for_the_deploy_check() {
        let out = expand(
            quote!(
                name = "vip",
                description = "vips",
                probe_config = "prefix = vip-"
            ),
            router_fn(),
        )
        .unwrap()
        .to_string();
        assert!(
            out.contains(r#"\"probe_config\":\"prefix = vip-\""#),
            "{out}"
        );
        let without = expand(quote!(name = "vip", description = "vips"), router_fn())
            .unwrap()
            .to_string();
        assert!(!without.contains("probe_config"), "{without}");
        assert!(
            error_of(
                quote!(
                    name = "a",
                    description = "x",
                    probe_config = "a",
                    probe_config = "b"
                ),
                router_fn()
            )
            .contains("given twice")
        );
    }

    #[test]
    fn a_stateful_router_uses_its_state_type() {
        let out = expand(
            quote!(name = "rr", description = "round robin"),
            quote! {
                fn route(state: &mut Counter, ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> { Ok(()) }
            },
        )
        .unwrap()
        .to_string();
        assert!(out.contains("Plugin < Counter >"), "{out}");
        assert!(out.contains("state_must_implement_default"));
    }

    #[test]
    fn a_missing_name_is_a_compile_error() {
        assert!(error_of(quote!(description = "x"), router_fn()).contains("missing `name"));
    }

    #[test]
    fn a_bad_name_is_refused_with_the_abi_rule() {
        assert!(
            error_of(quote!(name = "Key Hash", description = "x"), router_fn()).contains("a-z")
        );
    }

    #[test]
    fn unknown_and_repeated_arguments_are_refused() {
        assert!(
            error_of(
                quote!(name = "a", description = "x", colour = "red"),
                router_fn()
            )
            .contains("unknown argument")
        );
        assert!(
            error_of(
                quote!(name = "a", name = "b", description = "x"),
                router_fn()
            )
            .contains("given twice")
        );
        assert!(
            error_of(
                quote!(name = "a", description = "x", needs = [payload]),
                router_fn()
            )
            .contains("unknown need")
        );
        assert!(
            error_of(quote!(name = 3, description = "x"), router_fn()).contains("string literal")
        );
    }

    #[test]
    fn multi_line_descriptions_are_refused() {
        assert!(
            error_of(quote!(name = "a", description = "one\ntwo"), router_fn())
                .contains("one line")
        );
    }

    #[test]
    fn wrong_function_shapes_are_refused() {
        let attr = quote!(name = "a", description = "x");
        assert!(
            error_of(
                attr.clone(),
                quote!(
                    fn route(a: u32) {}
                )
            )
            .contains("a router takes")
        );
        assert!(
            error_of(
                attr.clone(),
                quote!(
                    async fn route(a: &A, b: &B, c: &mut C) {}
                )
            )
            .contains("async")
        );
        assert!(
            error_of(
                attr.clone(),
                quote!(
                    fn route(s: State, a: &A, b: &B, c: &mut C) {}
                )
            )
            .contains("&mut State")
        );
        assert!(
            error_of(
                attr,
                quote!(
                    struct NotAFn;
                )
            )
            .contains("expected")
        );
    }
}
